"""The JSON Schema front end: what a schema means, independent of any grammar engine.

Reads a schema under the dialect its ``$schema`` names (:mod:`.dialects`), rewrites it into
one canonical form before lowering (:mod:`.normalise`), and gives each standard ``format`` a
language the engines can enforce exactly or as a documented sound subset (:mod:`.formats`).
Resolves references and hoists their targets (:mod:`.references`), rewrites the schema into
exactly equivalent forms the engines enforce (:mod:`.lowering`, on the algebra of
:mod:`.algebra`: merge, negation, disjointness), and says what each engine would still read
differently, so that it refuses (:mod:`.refusals`; number ranges in :mod:`.numbers`); the
strict variants (:mod:`.strict`), the forms xgrammar builds exactly (:mod:`.xgrammar_forms`,
:mod:`.xgrammar_patterns`) and the quick meta-schema proof (:mod:`.meta_fast`) live here too.
Imports no grammar engine and no framework.
"""
