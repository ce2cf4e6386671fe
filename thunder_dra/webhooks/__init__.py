"""Admission validation of ThunderCluster and Client resources."""

from thunder_dra.webhooks.validation import (
    FieldError,
    format_errors,
    validate_client,
    validate_thundercluster,
)

__all__ = ["FieldError", "format_errors", "validate_client", "validate_thundercluster"]
