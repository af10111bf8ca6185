"""The JSON Schema front end: what a schema means, independent of any grammar engine.

Reads a schema under the dialect its ``$schema`` names (:mod:`.dialects`), rewrites it into
one canonical form before lowering (:mod:`.normalise`), and gives each standard ``format`` a
language the engines can enforce exactly or as a documented sound subset (:mod:`.formats`).
Imports no grammar engine and no framework.
"""
