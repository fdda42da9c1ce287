"""Front ends: other symbolic-graph libraries converted to jaxform Graphs directly.

Each front end is a submodule that imports its library lazily, so that
`import jaxform` works without them: `jaxform.frontends.pytensor`.
"""
