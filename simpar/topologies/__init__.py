"""Topologies: links, graphs with routing, clusters (presets and cluster files) and their builder."""

from simpar.topologies.builders import PRESETS, build, preset_cluster
from simpar.topologies.cluster import Cluster
from simpar.topologies.graph import Link, Topology

__all__ = ["PRESETS", "Cluster", "Link", "Topology", "build", "preset_cluster"]
