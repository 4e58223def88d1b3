"""The papers' own workloads for the simulator (issue 25, part 1): Optimus §6 (`optimus.py`) and
Dorm §V (`dorm.py`), each as a calibration of synthetic apps (the paper's job types, their speed
functions and loss curves), a seeded trace generator and the paper's cluster. bench/policies_sim.py
`--paper optimus|dorm` runs them; docs/simulator.md lists what each takes from its paper and where
it departs.
"""
