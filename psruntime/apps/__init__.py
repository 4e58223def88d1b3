"""ML apps of the PS runtime (MLR, NMF, LDA, Lasso) behind one interface (`base.PSApp`).

Import the registry lazily (`psruntime.apps.registry`) to get an app by name.
"""
