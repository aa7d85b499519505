"""The shm backend's wing: schedules on one host through POSIX shared memory (backend.py: ShmBackend).

backend.py owns the segments (segments.py), the barrier and its waits on the control segment (waits.Barrier)
and the schedule executor (executor.ShmExecutor), which runs a call natively (native.py, shm_native.c, with
the values of the planner plan.py and its measurement probe.py) or in Python. hybrid.py (backends/) reuses
the backend, its pulls and its barrier among a node's ranks.
"""
