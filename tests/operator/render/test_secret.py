"""The admin Secret: a random key, made once, then read back and kept."""

from __future__ import annotations

import base64

import kubernetes_validate
from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import parse
from pagoda.operator.render import render_children
from pagoda.operator.render.secret import admin_key_of, new_admin_key, render_admin_secret

BODY = {"metadata": {"name": "chat", "namespace": "ml", "uid": "u-1"}, "spec": {"model": "m"}}


def test_the_secret_holds_the_key_as_data_and_belongs_to_the_llmservice() -> None:
    secret = render_admin_secret(parse(BODY, OperatorConfig()), "k3y")
    kubernetes_validate.validate(secret, "1.30", strict=True)
    assert secret["metadata"]["name"] == "chat-admin"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert secret["type"] == "Opaque" and "stringData" not in secret
    assert secret["data"] == {"token": base64.b64encode(b"k3y").decode()}


def test_the_key_read_back_is_the_key_written() -> None:
    key = new_admin_key()
    assert admin_key_of(render_admin_secret(parse(BODY, OperatorConfig()), key)) == key


def test_new_keys_are_long_random_and_header_safe() -> None:
    keys = {new_admin_key() for _ in range(20)}
    assert len(keys) == 20
    assert all(len(k) >= 43 and k.replace("-", "").replace("_", "").isalnum() for k in keys)


def test_a_missing_or_broken_secret_has_no_key() -> None:
    assert admin_key_of(None) is None
    assert admin_key_of({"data": {}}) is None
    assert admin_key_of({"data": {"token": "not base64!"}}) is None
    assert admin_key_of({"data": {"token": ""}}) is None


def test_the_secret_is_applied_before_the_pods_and_left_alone_when_unreadable() -> None:
    config = OperatorConfig()
    llms = parse(BODY, config)
    kinds = [c["kind"] for c in render_children(llms, config, "k").present]
    assert kinds.index("Secret") < kinds.index("Deployment")
    assert "Secret" not in [c["kind"] for c in render_children(llms, config, None).present]
    assert "Secret" not in [r.kind for r in render_children(llms, config, None).absent]
