"""The Graph IR: SSA graphs with use lists that round-trip with jaxprs."""
from .graph import Graph, Node, Value
from .printing import diff, format_graph
from .loops import Carry, ScanLoop
from .regions import REGIONS, Region, cond_roles, scan_roles, while_roles

__all__ = ["Graph", "Node", "Value", "diff", "format_graph", "REGIONS", "Region", "scan_roles", "while_roles",
           "cond_roles", "ScanLoop", "Carry"]
