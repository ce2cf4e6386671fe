"""The shared log schema and the secret scrubber, as both processes configure them."""

from __future__ import annotations

import io
import json
import logging
import string
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider

from thunder_dra.process.logs import SCHEMA_KEYS, SecretScrubber, configure_logging
from thunder_dra.thunder import MASK, Secret

# Thunder API tokens and enrollment tokens are URL-safe text.
TOKENS = st.text(alphabet=string.ascii_letters + string.digits + "-_.", min_size=16, max_size=64)
# Text around a token: printable ASCII without the characters JSON escapes.
PLAIN = st.text(
    alphabet=sorted(set(string.printable) - set('"\\') - set(string.whitespace)), max_size=30
)
# Any text at all, for the decoded-value checks.
ANY_TOKEN = st.text(min_size=4, max_size=40).filter(lambda t: set(t) - set(MASK))


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def configured(log_format: str = "json") -> tuple[io.StringIO, SecretScrubber]:
    stream = io.StringIO()
    scrubber = configure_logging("debug", log_format, stream=stream, scrubber=SecretScrubber())
    return stream, scrubber


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().split("\n") if line.startswith("{")]


def strings_in(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)


class Carrier:
    """An object whose text holds the secret (an error, a config object)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return f"Carrier({self.text})"


def log_everywhere(log: logging.Logger, token: str, before: str, after: str) -> None:
    """The token in the message, the arguments, fields (nested, objects) and a traceback."""
    log.info(f"{before}{token}{after}")
    log.warning("%s-%s-%s", before, token, after)
    log.info(
        "fields",
        extra={
            "error": f"{before}{token}{after}",
            "nested": {"inner": [before + token, {"deeper": token + after}], token: 1},
            "object": Carrier(before + token + after),
            "count": 3,
        },
    )
    try:
        raise ValueError(f"{before}{token}{after}")
    except ValueError:
        log.exception("failed %s", after)


@pytest.mark.usefixtures("restore_root")
@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(token=TOKENS, before=PLAIN, after=PLAIN, log_format=st.sampled_from(["json", "text"]))
def test_a_registered_token_never_reaches_the_output(
    token: str, before: str, after: str, log_format: str
) -> None:
    stream, scrubber = configured(log_format)
    scrubber.add(Secret(token))
    log_everywhere(logging.getLogger("thunder_dra.test"), token, before, after)
    output = stream.getvalue()
    assert output.count("\n") >= 4
    assert token not in output
    assert MASK in output


@pytest.mark.usefixtures("restore_root")
@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(token=ANY_TOKEN, before=st.text(max_size=20), after=st.text(max_size=20))
def test_no_decoded_value_of_a_json_line_holds_a_token(token: str, before: str, after: str) -> None:
    stream, scrubber = configured("json")
    scrubber.add(token)
    log_everywhere(logging.getLogger("thunder_dra.test"), token, before, after)
    records = lines(stream)
    assert len(records) == 4
    for record in records:
        for text in strings_in(record):
            assert token not in text


@given(
    tokens=st.lists(ANY_TOKEN, min_size=1, max_size=4),
    text=st.text(max_size=60),
    data=st.data(),
)
def test_scrub_leaves_no_token_even_when_masking_joins_neighbours(
    tokens: list[str], text: str, data: st.DataObject
) -> None:
    scrubber = SecretScrubber()
    for token in tokens:
        scrubber.add(token)
    pieces = data.draw(st.lists(st.sampled_from([*tokens, MASK, text, "*"]), max_size=8))
    scrubbed = scrubber.scrub("".join(pieces))
    for token in tokens:
        assert token not in scrubbed


def test_both_formats_share_one_schema(restore_root: None) -> None:
    stream, _ = configured("json")
    logging.getLogger("thunder_dra.plugin.claims.prepare").info(
        "claim prepared", extra={"claim_uid": "u-1", "zone": "us-east"}
    )
    (record,) = lines(stream)
    assert list(record)[:4] == list(SCHEMA_KEYS)
    assert record["level"] == "info"
    assert record["logger"] == "thunder_dra.plugin.claims.prepare"
    assert record["message"] == "claim prepared"
    assert record["time"].endswith("+00:00")
    assert (record["claim_uid"], record["zone"]) == ("u-1", "us-east")
    assert "msg" not in record
    assert "trace_id" not in record

    text, _ = configured("text")
    logging.getLogger("thunder_dra.plugin.claims.prepare").info(
        "claim prepared", extra={"zone": "z"}
    )
    assert "INFO    thunder_dra.plugin.claims.prepare: claim prepared zone=z" in text.getvalue()


def test_a_field_cannot_replace_a_schema_key(restore_root: None) -> None:
    stream, _ = configured()
    logging.getLogger("thunder_dra.test").info("hello", extra={"level": "x", "logger": "y"})
    (record,) = lines(stream)
    assert (record["level"], record["logger"]) == ("info", "thunder_dra.test")


def test_kopf_object_loggers_give_an_object_field(restore_root: None) -> None:
    stream, _ = configured()
    # Real settings: kopf's own event poster on "kopf.objects" (installed once any test
    # has imported kopf's engines) reads them; posting off, so it posts nothing.
    kopf_settings = kopf.OperatorSettings()
    kopf_settings.posting.enabled = False
    logging.getLogger("kopf.objects.x").warning(
        "handler failed",
        extra={
            "settings": kopf_settings,
            "k8s_skip": False,
            "k8s_ref": {"kind": "ThunderCluster", "name": "main", "namespace": None},
        },
    )
    (record,) = lines(stream)
    assert record["object"] == "ThunderCluster/main"
    assert "settings" not in record
    assert "k8s_ref" not in record
    assert "k8s_skip" not in record


def test_lines_inside_a_span_carry_its_ids(restore_root: None) -> None:
    stream, _ = configured()
    tracer = TracerProvider().get_tracer("test")
    log = logging.getLogger("thunder_dra.test")
    with tracer.start_as_current_span("prepare") as span:
        log.info("inside")
    log.info("outside")
    inside, outside = lines(stream)
    context = span.get_span_context()
    assert inside["trace_id"] == format(context.trace_id, "032x")
    assert inside["span_id"] == format(context.span_id, "016x")
    assert "trace_id" not in outside
    assert "span_id" not in outside


def test_an_exception_is_one_field(restore_root: None) -> None:
    stream, _ = configured()
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("thunder_dra.test").exception("it failed")
    (record,) = lines(stream)
    assert record["message"] == "it failed"
    assert record["exception"].startswith("Traceback")
    assert "RuntimeError: boom" in record["exception"]


def test_arguments_that_do_not_fit_still_give_a_line(restore_root: None) -> None:
    stream, scrubber = configured()
    scrubber.add("tok-abcdefgh")
    logging.getLogger("thunder_dra.test").info("two %s %s", "tok-abcdefgh")
    (record,) = lines(stream)
    assert record["message"].startswith("two %s %s")
    assert "tok-abcdefgh" not in record["message"]


def test_a_removed_secret_is_no_longer_masked_and_short_ones_never_are() -> None:
    scrubber = SecretScrubber()
    key = scrubber.add(Secret(" enroll-token-1\n"))
    scrubber.add("abc")
    scrubber.add("*****")
    assert scrubber.scrub("x enroll-token-1 abc *****") == f"x {MASK} abc *****"
    scrubber.remove(key)
    assert scrubber.scrub("x enroll-token-1") == "x enroll-token-1"
    assert not scrubber.active


def test_records_are_scrubbed_for_every_handler(restore_root: None) -> None:
    """The filter rewrites the record, so a second handler (a test's caplog) sees the mask."""
    _, scrubber = configured()
    scrubber.add("the-api-token")
    captured: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            captured.append(record)

    keep = Keep()
    logging.getLogger().addHandler(keep)
    logging.getLogger("thunder_dra.test").info(
        "token %s", "the-api-token", extra={"t": "the-api-token"}
    )
    (record,) = captured
    assert record.getMessage() == f"token {MASK}"
    assert record.t == MASK  # type: ignore[attr-defined]
