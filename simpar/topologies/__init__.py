"""Topologies: links, graphs with routing, and the preset builders."""

from simpar.topologies.builders import PRESETS, build
from simpar.topologies.graph import Link, Topology

__all__ = ["PRESETS", "Link", "Topology", "build"]
