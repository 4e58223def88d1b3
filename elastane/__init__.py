"""Elastane's public Python API.

- `elastane.app_api`: the interface a PS app implements (docs/app_api.md), versioned.
Everything else in the tree is internal and may change between releases.
"""
