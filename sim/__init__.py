"""The discrete-event simulator: the real RM core, scheduler and policies on a virtual clock.

SLS-style (Hadoop's Scheduler Load Simulator): `rm.core.ResourceManagerCore` and a policy from
`rm.policies` run unchanged; NodeManagers and PS ApplicationMasters are simulated and talk to the
core through its own protocol methods (register / heartbeat / allocate / finish) with the same
messages a real daemon sends. Modules:

- `event_loop`    the virtual clock and its heap of events
- `trace`         the trace format (one job a JSON line; docs/simulator.md) and its reader / writer
- `workload`      a seeded generator of the papers' workloads (Optimus §6)
- `calibration`   per-app coefficients measured on a real cluster (sim/calibration.json by default)
- `convergence`   the Optimus loss curve: fit and epochs to a convergence threshold
- `sim_node`      a simulated NodeManager
- `sim_job`       a simulated PS ApplicationMaster (an interpreter of the AM's controller) and its job
- `step_costs`    what each of the controller's step instructions costs a simulated job
- `am_replay`     one job given directives at given times: its controller's log
- `job_record`    what is recorded of a job (arrival, start, end, shape over time)
- `metrics`       JCT, makespan, utilization, DRF fairness loss (Dorm)
- `simulator`     wires them together: `simulate(trace, policy, ...)`
- `plots`         PNG plots of a run (matplotlib, Agg)
"""
