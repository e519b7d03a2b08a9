from runtime import FinalAnswer, ToolCall, resume, start
from runtime.agents.agent import registry
from runtime.audit.chain import verify
from tests.kit import Ledger, events_of, make_agent


def test_a_run_executes_to_the_end(sqlite_path, tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    agent = make_agent("a", [ToolCall("read", {"key": "x"}), ToolCall("charge", {"amount": 5}),
                             FinalAnswer("done")], ledger)
    with registry.override(agent):
        run = start("a", {"q": 1})
        run = resume(run.pk, lease_seconds=5)
    assert run.status == "succeeded"
    assert run.output == "done"
    assert ledger.count("charge") == 1
    assert verify(run).ok
    kinds = events_of(run)
    assert kinds[0] == "run.created" and kinds[-1] == "lease.released"
