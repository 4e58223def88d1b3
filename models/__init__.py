"""Pure performance and convergence models shared by the PS ApplicationMaster and the RM policies.

What belongs here: models that predict how a job performs or converges (epoch time for a shape, a
loss curve, co-location interference) and that both an AM's optimizer and a cluster policy (in the
RM or the simulator) must compute the same way. No I/O, no clocks, no daemon state: numpy / scipy
and `protocol` only (imports go `protocol` <- `models` <- `rm`, `appmaster`).

- `cruise_cost`   Cruise's cost model, dissertation eq. 3.1-3.4: predicted epoch time of a shape
- `optimus_fit`   Optimus §3: the loss curve (eq. 1) and the speed functions (eq. 3, eq. 4), NNLS fits
- `ps_iteration_time`  Optimus's speed form (eq. 4) as an epoch time of (workers, servers), NNLS fit
"""
