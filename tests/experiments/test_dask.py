"""The sweeps run unchanged on a distributed engine: Dask's in-process LocalCluster through
``client.get_executor()`` gives the same tables as the default process pool (cells are seeded by
their parameters, never by scheduling).  Dask is a test/extra dependency, not a core one."""

import pytest

distributed = pytest.importorskip("distributed")
pytest.importorskip("pandas")

from experiments.law import block, sweep  # noqa: E402

GRID = {"k": [1, 3], "vocab": [256], "acceptance": [0.7]}
TIMING = ["cell_s", "setup_s", "verify_s", "us_per_round"]  # wall-clock columns


def runners():
    return {
        "sweep": lambda **kw: sweep.run_sweep(GRID, rounds=200, **kw),
        "block": lambda **kw: block.run_block(GRID, rounds=200, **kw),
    }


@pytest.mark.parametrize("name", ["sweep", "block"])
def test_dask_executor_gives_the_process_pool_table(tmp_path, name):
    run = runners()[name]
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        on_dask, summary, _ = run(executor=client.get_executor(), results_root=tmp_path / "dask")
    assert summary["computed_cells"] == len(on_dask) == 2
    on_pool, _, _ = run(workers=2, results_root=tmp_path / "pool")
    columns = sorted(set(on_pool.columns) - set(TIMING))
    assert on_dask[columns].equals(on_pool[columns])
