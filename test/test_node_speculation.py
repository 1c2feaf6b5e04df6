"""Speculative decoding through the node: the speculative_tokens parameter, the Generate result's
counters, per-token feedback, ~/status; the tokens equal the engine's plain greedy decoding."""
from __future__ import annotations

import pytest

from node_fixtures import active_node, client_of, ros_node  # noqa: F401 - fixture
from test_node_sessions import latest_status

PARAMS = {"model": "random-hybrid-tiny", "speculative_tokens": "3", "max_context": "256", "prefill_chunk": "32"}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with active_node(tmp_path_factory.mktemp("spec"), "spec", PARAMS) as n:
        yield n


def plain_greedy(prompt: str, new_tokens: int) -> list[int]:
    """The same model and chunking in this process, without speculation."""
    from flashrt_ros.engine import LLMEngine
    from flashrt_ros.models.registry import load_model

    model, tok, _, fp = load_model("random-hybrid-tiny", seed=0)
    engine = LLMEngine(model, tok, max_context=256, prefill_chunk=32, fingerprint_inputs=fp)
    return engine.generate(prompt, max_new_tokens=new_tokens, stop_ids=[]).token_ids


def test_generate_speculates_reports_every_token_and_counts_drafts(node, ros_node):  # noqa: F811
    client = client_of(node, ros_node)
    feedback: list = []
    outcome = client.generate("Speculate through ROS", feedback=feedback.append, max_new_tokens=24,
                              use_chat_template=False, reset=True, timeout_s=120)
    result = outcome.result
    assert outcome.accepted and result.success, result.message
    got = list(result.token_ids)                    # a stop token may end it early
    assert got and got == plain_greedy("Speculate through ROS", 24)[:len(got)]
    assert result.drafted_tokens >= 3 and result.drafted_tokens % 3 == 0
    assert result.accepted_tokens <= result.drafted_tokens
    assert outcome.feedback_complete
    assert [fb.index for fb in feedback] == list(range(len(result.token_ids)))
    positions = [fb.position for fb in feedback]
    assert positions == list(range(positions[0], positions[0] + len(positions)))    # one per token, in order
    status = latest_status(ros_node, f"{node.namespace}/flashrt/status",
                           lambda s: s.drafted_tokens >= result.drafted_tokens)
    assert status is not None and status.speculative_tokens == 3
    assert (status.drafted_tokens, status.accepted_tokens) >= (result.drafted_tokens, result.accepted_tokens)


def test_a_model_without_an_mtp_head_refuses_speculation_at_configure(tmp_path, ros_node):  # noqa: F811
    from lifecycle_msgs.msg import Transition

    from rosproc import NodeUnderTest
    from test_node_lifecycle import Lifecycle

    n = NodeUnderTest(tmp_path, "nomtp", {"model": "random-llama-tiny", "speculative_tokens": "2"},
                      autostart=False)
    try:
        lc = Lifecycle(ros_node, f"{n.namespace}/flashrt")
        assert not lc.transition(Transition.TRANSITION_CONFIGURE)
        assert lc.state() == "unconfigured"
        assert "no multi-token-prediction head" in n.log.read_text()
    finally:
        assert n.stop() == 0, n.log.read_text()


def test_out_of_range_speculative_tokens_are_refused_before_anything_loads():
    from flashrt_ros.interface.node_params import PARAMS as DEFS
    from flashrt_ros.interface.parameters import check_value

    spec = next(p for p in DEFS if p.name == "speculative_tokens")
    assert spec.read_only and spec.default == 0
    assert check_value(spec, 9) and check_value(spec, -1) and check_value(spec, 2.0)
    assert check_value(spec, 4) is None
