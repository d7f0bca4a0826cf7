"""Operator-mode credentials made in the test: operator, account and user JWTs signed with
real nkeys, a `.creds` file, and the nats-server config that trusts them (resolver MEMORY).
No nsc needed; the JWT layout is the one nats-server validates (header, claims, ed25519).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import nkeys


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _keypair(prefix: int) -> tuple[bytes, nkeys.KeyPair]:
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    return seed, nkeys.from_seed(seed)


def _jwt(claims: dict, issuer: nkeys.KeyPair) -> str:
    claims = {"iat": int(time.time()), "iss": issuer.public_key.decode(), **claims}
    digest = hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    payload = _b64(json.dumps(claims).encode())
    signature = _b64(issuer.sign(f"{header}.{payload}".encode()))
    return f"{header}.{payload}.{signature}"


@dataclass
class OperatorSetup:
    server_config: str  # to splice into a nats-server config
    bridge_creds: Path  # a user that may only subscribe to `bridge_subjects`
    app_creds: Path  # an unrestricted user of the same account
    secret_seeds: tuple[str, ...]  # must never appear in logs or metrics


def _user(workdir: Path, name: str, account: nkeys.KeyPair, permissions: dict) -> tuple[Path, str]:
    seed, user = _keypair(nkeys.PREFIX_BYTE_USER)
    claims = {"subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2, **permissions}
    user_jwt = _jwt({"sub": user.public_key.decode(), "name": name, "nats": claims}, account)
    creds = workdir / f"{name}.creds"
    creds.write_text(
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed.decode()}\n"
        "------END USER NKEY SEED------\n"
    )
    creds.chmod(0o600)
    return creds, seed.decode()


def operator_setup(workdir: Path, bridge_subjects: list[str]) -> OperatorSetup:
    """One operator, account A, a least-privilege bridge user and an application user."""
    _, operator = _keypair(nkeys.PREFIX_BYTE_OPERATOR)
    _, account = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    op_pub, acc_pub = operator.public_key.decode(), account.public_key.decode()
    operator_jwt = _jwt({"sub": op_pub, "name": "test-operator", "nats": {"type": "operator", "version": 2}}, operator)
    limits = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True, "conn": -1,
              "leaf": -1}
    account_jwt = _jwt({"sub": acc_pub, "name": "A", "nats": {"limits": limits, "type": "account", "version": 2}},
                       operator)
    # The servers send trace messages through their internal (system account) send loop:
    # without a system account no trace message is ever published.
    _, system = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    sys_pub = system.public_key.decode()
    system_jwt = _jwt({"sub": sys_pub, "name": "SYS", "nats": {"limits": limits, "type": "account", "version": 2}},
                      operator)
    bridge_creds, bridge_seed = _user(
        workdir, "bridge", account, {"sub": {"allow": bridge_subjects}, "pub": {"deny": [">"]}}
    )
    app_creds, app_seed = _user(workdir, "app", account, {})
    config = (
        f'operator: "{operator_jwt}"\nsystem_account: {sys_pub}\nresolver: MEMORY\n'
        f'resolver_preload: {{\n  {acc_pub}: "{account_jwt}"\n  {sys_pub}: "{system_jwt}"\n}}\n'
    )
    return OperatorSetup(config, bridge_creds, app_creds, (bridge_seed, app_seed))
