"""The planner corpus: specs, the fleets they are planned for, and what the planner made of them.

Why: the planner is refactored in steps (recipe modules, a typed plan, files moved); every step must plan
each recorded case exactly as before, or re-record it on purpose (`python -m tests.planner_corpus --write`)
so the change shows in review as a diff of `expected.json`.
"""
