"""The kernel: the one owner of live state, and how the scheduler's actions become real.

orchestrator.py     Orchestrator: the pump (events in, actions out) and policy apply
effects.py          KernelEffects: spawn, stop, wait for memory, answer waiters
swap_steps.py       SwapSteps: how long each step of a stop and a start took (swap events)
sleeping.py         SleepMode: evicting a runtime by putting it to sleep (vLLM)
policy_reload.py    SIGHUP: the policy file applied again
takeover.py         adopting (or reaping) what a previous daemon left running
routing.py          each service's route table and request shapes, per policy
tickets.py          Tickets: operators awaiting the answer to load, unload, restart
tuning.py           AutoTuning: ``yielding: auto``'s rounds in a background process
views.py            the JSON views of live state (GET /api/services, ps, the dashboard)
background.py       BackgroundTasks: work an owner must finish or cancel when it closes
"""
