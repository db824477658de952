"""Moved to :mod:`adaptive_decoding.framework.engine.nesting` (the one nesting mechanism is part of the controller
contract, and plugins import it as ``from framework import Composite, Wrapper``); these names stay
importable from here for code written against the old place."""

from adaptive_decoding.framework.engine.nesting import Child, Composite, Wrapper, build_nested, wrapped_params

__all__ = ["Child", "Composite", "Wrapper", "build_nested", "wrapped_params"]
