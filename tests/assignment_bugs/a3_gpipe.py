"""Planted bug: GPipe's order (all forwards, then all backwards) - valid, but not 1F1B."""


def one_f_one_b(stages, microbatches):
    return [[("F", mb) for mb in range(microbatches)] + [("B", mb) for mb in range(microbatches)]
            for _ in range(stages)]
