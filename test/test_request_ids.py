"""Every changing service takes a client-chosen request id; the node answers a copy with the first answer
(issue #55, item 1): a lost reply can always be re-sent, and nothing is applied twice."""
from __future__ import annotations

import uuid

import pytest

from node_fixtures import active_node, client_of, ros_node  # noqa: F401 - fixture
from waiting import wait_until
from flashrt_ros.interface.errors import ErrorCode
from flashrt_ros.interface.services import VERBS
from flashrt_ros.ros.request_ledger import RequestLedger


def test_every_changing_verb_takes_a_request_id_and_the_readers_do_not():
    readers = {"list", "verify"}
    for verb in VERBS:
        assert verb.takes_request_id == (verb.name not in readers), verb.name


def test_the_ledger_answers_copies_refuses_reuse_and_forgets_the_oldest():
    ledger = RequestLedger(capacity=2)
    assert ledger.begin("a", "fork", ("x",)) == ("run", None)
    decision, entry = ledger.begin("a", "fork", ("x",))
    assert decision == "copy" and ledger.answer(entry, 0.0) is None       # still running: nothing yet
    ledger.finish("a", "answer-a")
    assert ledger.answer(entry, 0.0) == "answer-a"
    decision, why = ledger.begin("a", "drop", ("x",))
    assert decision == "conflict" and "another request (fork)" in why
    assert ledger.begin("a", "fork", ("y",))[0] == "conflict"               # same verb, other fields
    ledger.begin("b", "drop", ())
    ledger.begin("c", "drop", ())                                          # over capacity: "a" goes
    assert ledger.begin("a", "fork", ("x",)) == ("run", None)
    ledger.forget("c")                                                     # nothing applied: runs afresh
    assert ledger.begin("c", "drop", ()) == ("run", None)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with active_node(tmp_path_factory.mktemp("ids"), "ids") as n:
        yield n


def _twice(client, verb: str, **fields):
    """The same request sent twice under one id (as a client whose first reply was lost): both answers."""
    futures = [client.call_async(verb, **fields) for _ in range(2)]
    wait_until(lambda: all(f.done() for f in futures), 60, f"both {verb} answers")
    return [f.result() for f in futures]


def test_a_copy_is_answered_with_the_first_answer_and_applied_once(node, ros_node):  # noqa: F811
    """Without the ledger the copy of a drop answered NOT_FOUND (the first had dropped it) and the copy of a
    fork ALREADY_EXISTS: a client re-sending a lost reply saw a failure for work that was done."""
    client = client_of(node, ros_node)
    client.call("snapshot", name="base", overwrite=True, wait_s=60)
    rid = uuid.uuid4().hex
    first, copy = _twice(client, "fork", source="base", name="branch", request_id=rid)
    assert first.success and copy.success, (first.message, copy.message)
    assert copy.capsule.name == first.capsule.name == "branch" and copy.message == first.message
    first, copy = _twice(client, "drop", name="branch", request_id=uuid.uuid4().hex)
    assert first.success and copy.success, (first.message, copy.message)
    names = [c.name for c in client.call("list").capsules]
    assert "branch" not in names and "base" in names
    reused = client.call("drop", name="base", request_id=rid, check=False)      # the fork's id, another request
    assert not reused.success and reused.error_code == int(ErrorCode.INVALID_ARGUMENT)
    assert "was used for another request (fork)" in reused.message
    assert "base" in [c.name for c in client.call("list").capsules]           # nothing dropped
