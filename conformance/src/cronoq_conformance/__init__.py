"""The conformance kit every cronoq ``Store`` must pass.

A store author writes one test module::

    from cronoq_conformance import StoreConformance, StoreHarness

    class TestMyStore(StoreConformance):
        @pytest.fixture
        def harness(self, tmp_path) -> StoreHarness:
            return MyHarness(tmp_path)

``StoreConformance`` runs every suite; ``StoreSuite`` (the store alone), ``EngineSuite`` (a real
``Scheduler`` over the store) and ``SimulationSuite`` (random histories with crashes) can also be
used on their own. The base classes are not named ``Test*``, so only the subclass is collected.
See docs/stores/writing-a-store.md.
"""

from cronoq_conformance._engine_suite import EngineSuite
from cronoq_conformance._faults import CommitFault, FaultyStore
from cronoq_conformance._harness import (
    Capability,
    ClusterRows,
    DatabaseCondition,
    PendingOutboxRow,
    StoreHarness,
    run_in_python,
    task_row,
)
from cronoq_conformance._protocol_suite import StoreSuite
from cronoq_conformance._simulation import SimulationSuite

__all__ = [
    "Capability",
    "ClusterRows",
    "CommitFault",
    "DatabaseCondition",
    "EngineSuite",
    "FaultyStore",
    "PendingOutboxRow",
    "SimulationSuite",
    "StoreConformance",
    "StoreHarness",
    "StoreSuite",
    "run_in_python",
    "task_row",
]


class StoreConformance(StoreSuite, EngineSuite, SimulationSuite):
    """All of the suites. Subclass it as ``Test<YourStore>`` and provide a ``harness`` fixture."""
