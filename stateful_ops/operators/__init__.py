"""The ready operators, one module per operator: running_count, running_aggregate,
deduplicate and sessionize.

Each is a ``StatefulOperator`` (``stateful_ops/base.py``: key groups, one state row per
group, vectorised pandas); its module holds the class, the function users call and its
per-key contract. ``partial_aggregation`` holds the pre-shuffle step running_count and
running_aggregate share, ``shared`` the column names and key numbering several use.

Why a subpackage and not modules beside ``base.py``: a module ``stateful_ops/running_count.py``
would share its name with the function ``eospack.stateful_ops.running_count`` that the
package exports, and the function would shadow the module; here the machinery (base, state
codec, store, initial state) and the ready operators built on it also stay apart. The
public names are those of ``eospack.stateful_ops.__all__``; this package re-exports nothing,
so its module paths stay internal.
"""
