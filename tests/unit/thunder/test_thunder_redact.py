"""Secrets stay masked wherever they might be printed."""

from __future__ import annotations

import logging
import pickle

import pytest
from pydantic import BaseModel

from thunder_dra.thunder import MASK, Secret, scrub

VALUE = "tr_super-secret-enrollment-token"


def test_secret_never_shows_itself() -> None:
    secret = Secret(VALUE)
    assert VALUE not in repr(secret)
    assert VALUE not in str(secret)
    assert VALUE not in f"{secret}"
    assert VALUE not in f"{secret!r:>60}"
    assert VALUE not in "%s %r" % (secret, secret)  # noqa: UP031 - %-formatting is what logging uses
    assert secret.reveal() == VALUE


def test_secret_in_logs_is_masked(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        logging.getLogger("test").info("token %s", Secret(VALUE), extra={"t": Secret(VALUE)})
    assert VALUE not in caplog.text
    assert MASK in caplog.text


def test_secret_equality_strip_and_wrapping() -> None:
    assert Secret("a b") == Secret("a b")
    assert Secret("a") != Secret("b")
    assert Secret(" tok \n").stripped() == Secret("tok")
    same = Secret("x")
    assert Secret.of(same) is same
    assert Secret.of("x") == same
    assert not Secret("")
    assert len(Secret("abc")) == 3


def test_secret_refuses_pickling_and_non_strings() -> None:
    with pytest.raises(TypeError):
        pickle.dumps(Secret(VALUE))
    with pytest.raises(TypeError):
        Secret(b"bytes")  # type: ignore[arg-type]


def test_secret_in_pydantic_models() -> None:
    class Holder(BaseModel):
        token: Secret

    holder = Holder.model_validate({"token": VALUE})
    assert holder.token.reveal() == VALUE
    assert VALUE not in repr(holder)
    assert VALUE not in holder.model_dump_json()
    assert Holder(token=Secret(VALUE)).token == holder.token
    assert Holder.model_validate_json(f'{{"token": "{VALUE}"}}').token == holder.token


def test_scrub_replaces_every_secret_value() -> None:
    text = f"echo {VALUE} and again {VALUE}; bearer abc"
    cleaned = scrub(text, [Secret(VALUE), None, "abc"])
    assert VALUE not in cleaned
    assert cleaned.count(MASK) == 2
    # Values too short to be credentials are left alone rather than mangling text.
    assert "abc" in cleaned
