"""What every lesson's cells are made of."""

from __future__ import annotations

from nbformat.v4 import new_code_cell, new_markdown_cell

SETUP = """import matplotlib.pyplot as plt
from simpar import plots, units
from simpar.models import model
from simpar.scenario import make_scenario
from simpar.sim import simulate"""


def md(text: str):
    return new_markdown_cell(text.strip())


def code(text: str):
    return new_code_cell(text.strip())
