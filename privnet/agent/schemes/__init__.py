"""The privacy schemes as parts: one module per scheme, a base class and a registry.

`registry` holds the names (privnet.agent.spec.Scheme) and loads a scheme's part when it is
first asked for, so that naming a scheme costs no numpy (the broker imports the spec).
Adding a scheme: docs/tasks/privacy.md, "Adding a scheme".
"""
