"""cache_salt folds into the namespace (SPEC M17): tenants never share a row.

The fold is :func:`llamad.model.identity.salted`; a namespace covers every
tier, so keys (and the fingerprint written into each ``.kvc`` file) differ
for every salt. These run without a model; the real cache is exercised in
``tests/integration/model/test_cache_view_cache.py``.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from llamad.cache.errors import InvalidCacheValue
from llamad.cache.key import Namespace, tokens_to_bytes
from llamad.cache.prefix import PrefixIndex
from llamad.model.identity import SALT_DOMAIN, salted

pytestmark = pytest.mark.timeout(60)

SHARED = Namespace(fingerprint=b"\x11" * 32, quant=3, ctx_hash=b"\x22" * 32)
TOKENS = list(range(1, 65))


def test_two_salts_and_no_salt_are_three_namespaces_with_distinct_keys() -> None:
    a, b = salted(SHARED, b"tenant-a"), salted(SHARED, b"tenant-b")
    assert salted(SHARED, None) is SHARED
    assert len({SHARED.fingerprint, a.fingerprint, b.fingerprint}) == 3
    assert len({SHARED.key(TOKENS), a.key(TOKENS), b.key(TOKENS)}) == 3
    # Only the fingerprint moves: the quant byte and the KV layout are the model's.
    assert {(ns.quant, ns.ctx_hash) for ns in (SHARED, a, b)} == {(3, b"\x22" * 32)}


def test_the_salted_fingerprint_is_the_documented_domain_separated_hash() -> None:
    expected = hashlib.sha256(b"llamad.cache_salt.v1\x00" + SHARED.fingerprint + b"t").digest()
    assert SALT_DOMAIN == b"llamad.cache_salt.v1\x00"
    assert salted(SHARED, b"t").fingerprint == expected
    # Pinned bytes: a change here orphans every tenant's rows on disk.
    assert expected.hex().startswith("b0086e51")


def test_a_salt_never_yields_the_shared_namespace_of_another_fingerprint() -> None:
    # Salting is not concatenation: ("ab", fingerprint) and ("b", another) differ.
    other = Namespace(fingerprint=b"\x12" * 32, quant=3, ctx_hash=b"\x22" * 32)
    assert salted(SHARED, b"ab") != salted(other, b"b")
    assert salted(SHARED, b"x") != salted(salted(SHARED, b"x"), b"x")


def test_the_same_salt_names_the_same_namespace_in_another_process() -> None:
    code = (
        "from llamad.cache.key import Namespace; from llamad.model.identity import salted;"
        "ns = Namespace(fingerprint=b'\\x11' * 32, quant=3, ctx_hash=b'\\x22' * 32);"
        "print(salted(ns, 'tenant-\\u00e9'.encode()).key(list(range(1, 65))).hex())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    here = salted(SHARED, "tenant-\u00e9".encode()).key(TOKENS).hex()
    assert out.stdout.strip() == here


@pytest.mark.parametrize("salt", [b"", "tenant", 7])
def test_an_empty_or_non_bytes_salt_is_refused_naming_the_field(salt: object) -> None:
    with pytest.raises(InvalidCacheValue) as err:
        salted(SHARED, salt)  # type: ignore[arg-type]
    assert err.value.details["field"] == "cache_salt"


def test_a_row_saved_under_one_salt_is_not_found_under_another_or_none() -> None:
    # The matching code cache-meta runs (PrefixIndex) keeps namespaces apart:
    # the same tokens under another salt are a miss, not even a common prefix.
    index = PrefixIndex()
    a = salted(SHARED, b"tenant-a")
    data = tokens_to_bytes(TOKENS)
    index.add(a.header(), data, a.key(TOKENS))
    for ns in (SHARED, salted(SHARED, b"tenant-b")):
        found = index.match(ns.header(), data)
        assert found.common_tokens == 0 and found.common_key is None
    assert index.match(a.header(), data).prefix_key == a.key(TOKENS)
