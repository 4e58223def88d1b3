"""Cruise: cost-based optimizer of a PS job's shape (dissertation ch. 3, §3.2-3.3.1).

Pure core, no I/O and an injected clock, so the PS ApplicationMaster drives it:

- `metrics`        per-executor moving averages of what workers and servers report
- `trigger`        when a decision may be taken (K mini-batches per worker since the last change)
- `profiling`      measured metrics -> cost-model inputs (per-sample compute, bandwidths)
- the cost model (eq. 3.1-3.4, predicted epoch time of a configuration) is `models.cruise_cost`: RM policies need it too
- `balance`        optimal integer split of input / model blocks once roles are fixed
- `solver_homogeneous`  closed form of eq. 3.5 (identical nodes), plus the brute-force baseline
- `solver_milp`    MILP (scipy.optimize.milp / HiGHS) for heterogeneous nodes, grouped in classes
- `baselines`      brute-force searches the solvers are tested and benchmarked against
- `targets`        solver counts -> roles per slot, preferring each executor's current role
- `plan`, `plan_builder`  the reconfiguration DAG of add / delete / switch / move and its execution state
- `optimizer`      metrics -> profiles -> solver -> plan, with the gain threshold and a decision log
"""
