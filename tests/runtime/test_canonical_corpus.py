"""The canonical form is a stored contract: every hash in every existing database was taken
over it. A corpus of payloads (unicode, escapes, floats at the edges, big integers, nesting,
the runtime's own event payloads) and the canonical text, digest and chain link each had when
the fixture was made (``canonical_corpus.json``) must come out byte for byte the same, however
the encoder is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.canonical import chain_hash, digest, dumps, request_digest

CORPUS = json.loads((Path(__file__).parent / "canonical_corpus.json").read_text())
VALUES = [entry for entry in CORPUS if "value" in entry]


@pytest.mark.parametrize("index", range(len(VALUES)))
def test_each_payload_keeps_its_canonical_text_and_digest(index):
    entry = VALUES[index]
    assert dumps(entry["value"]) == entry["canonical"]
    assert digest(entry["value"]) == entry["digest"]


def test_the_chain_over_the_corpus_is_unchanged():
    head = ""
    for entry in VALUES:
        head = chain_hash(head, dumps(entry["value"]))
        assert head == entry["chain"]
    (last,) = [entry for entry in CORPUS if "request_digest" in entry]
    assert request_digest("charge", {"amount": 7}, "side_effect") == last["request_digest"]


def test_the_corpus_covers_the_edges():
    texts = [entry["canonical"] for entry in VALUES]
    assert len(VALUES) >= 80
    assert any("😀" in t for t in texts) and any("\\u0000" in t for t in texts)
    assert "-0.0" in texts and "1e+100" in texts and str(2**63 - 1) in texts
