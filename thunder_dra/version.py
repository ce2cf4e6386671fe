"""Build version and the User-Agent the Thunder API sees."""

from importlib import metadata

try:
    __version__ = metadata.version("thunder-device-plugin")
except metadata.PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+source"


def user_agent(component: str) -> str:
    """The User-Agent for Thunder API calls made by ``component`` (operator or daemon)."""
    return f"thunder-device-plugin/{__version__} ({component})"
