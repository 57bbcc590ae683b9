"""The benchmark suite (``quickdraft bench``) and the pair doctor (``quickdraft doctor``).

Entry points on top of the library: they parse, call quickdraft and transformers, and print.
The library never imports them.
"""
