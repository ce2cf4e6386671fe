"""Go-style durations ("60s", "5m", "1h30m", "1.5h", "300ms") for settings.

Kubernetes users write durations the way Go's `time.ParseDuration` reads them, so
the spec keeps the user's text (a `Duration` is a `str`) and parses it on demand.
Units: ns, us, ms, s, m, h; a sign is accepted so that "-5s" is reported as out of
range rather than as a syntax error. Values beyond Go's own range (int64 nanoseconds,
about 2562047h) are refused as Go refuses them, so a huge number is a clean error and
never an arithmetic overflow. Sub-microsecond parts are dropped because `timedelta`
cannot hold them; no setting here needs them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from decimal import Context, Decimal
from typing import Any, Final

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

DURATION_MAX_LENGTH: Final = 64
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_UNIT = r"(?:ns|us|ms|s|m|h)"
DURATION_PATTERN: Final = rf"^[-+]?(?:0|(?:{_NUMBER}{_UNIT})+)$"
_DURATION_RE: Final = re.compile(DURATION_PATTERN)
_PART_RE: Final = re.compile(rf"({_NUMBER})({_UNIT})")

MAX_NANOSECONDS: Final = 2**63 - 1
"""Go's largest duration, 2562047h47m16.854775807s."""
# Exact arithmetic for the longest text the pattern and DURATION_MAX_LENGTH allow.
_EXACT: Final = Context(prec=2 * DURATION_MAX_LENGTH + 16)

_NANOS_PER_UNIT: Final = {
    "ns": Decimal(1),
    "us": Decimal(1_000),
    "ms": Decimal(1_000_000),
    "s": Decimal(1_000_000_000),
    "m": Decimal(60_000_000_000),
    "h": Decimal(3_600_000_000_000),
}


def parse_duration(text: str) -> timedelta:
    """Parse a Go duration string; raise ValueError with the reason when it is not one."""
    if not _DURATION_RE.fullmatch(text):
        raise ValueError(
            f'"{text}" is not a duration; write a number and a unit (ns, us, ms, s, m, h), '
            'as in "60s", "5m" or "1h30m"'
        )
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("+-")
    if len(body) > DURATION_MAX_LENGTH:
        raise ValueError(f"is longer than {DURATION_MAX_LENGTH} characters")
    nanos = Decimal(0)
    for number, unit in _PART_RE.findall(body):
        nanos = _EXACT.add(nanos, _EXACT.multiply(Decimal(number), _NANOS_PER_UNIT[unit]))
        if nanos > MAX_NANOSECONDS:
            raise ValueError(
                f'"{text}" is out of range: the largest duration is 2562047h47m16.854775807s'
            )
    return timedelta(microseconds=sign * int(_EXACT.divide_int(nanos, Decimal(1000))))


def format_duration(value: timedelta) -> str:
    """Render a timedelta compactly in Go syntax: 90s -> "1m30s", 0.3s -> "300ms"."""
    micros = value // timedelta(microseconds=1)
    if micros == 0:
        return "0s"
    sign = "-" if micros < 0 else ""
    micros = abs(micros)
    if micros < 1_000_000:
        if micros % 1000 == 0:
            return f"{sign}{micros // 1000}ms"
        return f"{sign}{micros}us"
    hours, rest = divmod(micros, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds = Decimal(rest) / Decimal(1_000_000)
    text = f"{hours}h" if hours else ""
    text += f"{minutes}m" if minutes else ""
    if seconds:
        text += f"{seconds.normalize():f}s"
    return sign + text


class Duration(str):
    """A Go duration kept as written; `to_timedelta()` gives its value."""

    __slots__ = ()

    def to_timedelta(self) -> timedelta:
        return parse_duration(self)

    def total_seconds(self) -> float:
        return self.to_timedelta().total_seconds()

    @classmethod
    def _validate(cls, value: str) -> Duration:
        try:
            parse_duration(value)
        except ValueError as exc:
            raise PydanticCustomError("duration", "{reason}", {"reason": str(exc)}) from None
        return cls(value)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls._validate,
            core_schema.str_schema(max_length=DURATION_MAX_LENGTH),
            serialization=core_schema.plain_serializer_function_ser_schema(str),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {
            "type": "string",
            "pattern": DURATION_PATTERN,
            "maxLength": DURATION_MAX_LENGTH,
        }


@dataclass(frozen=True, slots=True)
class DurationRange:
    """Annotation bounding a `Duration` field, both ends inclusive."""

    minimum: str
    maximum: str

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # The API server checks the range too (CEL parses Go durations), so a stored
        # object is in range even when the webhook is down.
        json_schema = handler(schema)
        json_schema["x-kubernetes-validations"] = [
            {
                "rule": f"duration(self) >= duration('{self.minimum}') && "
                f"duration(self) <= duration('{self.maximum}')",
                "message": f"must be between {self.minimum} and {self.maximum}",
            }
        ]
        return json_schema

    def _check(self, value: Duration) -> Duration:
        if not parse_duration(self.minimum) <= value.to_timedelta() <= parse_duration(self.maximum):
            raise PydanticCustomError(
                "duration_range",
                'must be between {minimum} and {maximum}, got "{value}"',
                {"minimum": self.minimum, "maximum": self.maximum, "value": str(value)},
            )
        return value
