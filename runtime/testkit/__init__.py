"""The crash test kit (design §11): kill a worker at any named point and prove that nothing
ran twice on its own.

Two kits share the crash points, the operator and the invariants:

- ``ProcessKit`` runs each step in a fresh ``manage.py`` process armed through its environment;
  a crash is a real SIGKILL, and the next process opens the database file afresh.
- ``InProcessKit`` raises ``SimulatedCrash`` at the point instead and abandons the lease, with
  a manual clock: fast enough for hundreds of cases in a consumer's own test suite.

``check_invariants`` counts side effects from the outside world's ledger, never from the
runtime's own tables. A crash that was requested and never reached fails the check.

Example (pytest, with your agent's tools recording calls in ``ledger``)::

    kit = InProcessKit(ledger)
    run = kit.start("refunds", {"order": 42})
    kit.crash(run, Crash(CrashPoint.AFTER_TOOL_STARTED, step_index=2))
    kit.take_over(run)                       # waits for a person: the charge may have happened
    kit.operate(lambda approval: APPROVE)    # one re-run, authorized
    kit.drain()
    kit.check()                              # raises InvariantViolation, naming the evidence
"""

from runtime.crashpoints import CrashPoint
from runtime.errors import CrashNotReached, InvariantViolation, SimulatedCrash
from runtime.testkit.inprocess_kit import InProcessKit
from runtime.testkit.invariants import Report, Violation, check_invariants
from runtime.testkit.ledger import Ledger
from runtime.testkit.operator import APPROVE, REJECT, Decision, decide, resolve_with
from runtime.testkit.process_kit import Exited, ProcessKit
from runtime.testkit.reached import Crash, Reached

__all__ = [
    "APPROVE", "REJECT", "Crash", "CrashNotReached", "CrashPoint", "Decision", "Exited",
    "InProcessKit", "InvariantViolation", "Ledger", "ProcessKit", "Reached", "Report",
    "SimulatedCrash", "Violation", "check_invariants", "decide", "resolve_with",
]
