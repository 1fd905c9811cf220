"""Tools of the repository that are not part of the package (the wheel and the image leave them
out): the benchmarks, `tools/bench`. Run them from the repository's root."""
