"""Parts the tests share: tiny models, inputs, stage commands and workflow runs.

Test modules import from here (``from helpers.rollout import random_policy``; pytest puts tests/
on ``sys.path``) and never from one another; shared fixtures live in tests/conftest.py.
"""
