"""Secret values that stay masked in repr, str, format, logs and pydantic dumps.

The API token, enrollment tokens, the exchanged ``authToken`` and the JWT are all held
as :class:`Secret`. Code that must send one (an ``Authorization`` header, a
``config.json`` the daemon writes) calls :meth:`Secret.reveal` at that one place.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Any, final

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

MASK = "**********"

# Scrubbing values shorter than this would mangle unrelated text and protects nothing.
_MIN_SCRUB_LENGTH = 4


@final
class Secret:
    """A string that never shows itself except through :meth:`reveal`."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"a Secret wraps a str, not {type(value).__name__}")
        self._value = value

    @classmethod
    def of(cls, value: str | Secret) -> Secret:
        """Wrap ``value`` unless it already is a Secret."""
        return value if isinstance(value, Secret) else cls(value)

    def reveal(self) -> str:
        """The secret text itself; call it only where the value must leave the process."""
        return self._value

    def stripped(self) -> Secret:
        """A copy without surrounding whitespace (tokens pasted into Secrets gain newlines)."""
        return Secret(self._value.strip())

    def __repr__(self) -> str:
        return f"Secret('{MASK}')" if self._value else "Secret('')"

    def __str__(self) -> str:
        return MASK if self._value else ""

    def __format__(self, format_spec: str) -> str:
        return format(str(self), format_spec)

    def __bool__(self) -> bool:
        return bool(self._value)

    def __len__(self) -> int:
        return len(self._value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> Any:
        # Pickling would write the plain value into whatever stores the pickle.
        raise TypeError("Secret values cannot be pickled")

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        from_str = core_schema.no_info_after_validator_function(cls, core_schema.str_schema())
        return core_schema.json_or_python_schema(
            json_schema=from_str,
            python_schema=core_schema.union_schema([core_schema.is_instance_schema(cls), from_str]),
            serialization=core_schema.plain_serializer_function_ser_schema(str),
        )


def scrub(text: str, secrets: Iterable[Secret | str | None]) -> str:
    """``text`` with every occurrence of the given secret values replaced by the mask."""
    for secret in secrets:
        if secret is None:
            continue
        value = secret.reveal() if isinstance(secret, Secret) else secret
        if len(value) >= _MIN_SCRUB_LENGTH:
            text = text.replace(value, MASK)
    return text
