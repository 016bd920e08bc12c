"""Side-by-side verifier benchmark (also `specverify bench`): see specverify.bench and the README."""

import argparse
import sys

from specverify.bench import add_bench_arguments, run_bench_command

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_bench_arguments(parser)
    sys.exit(run_bench_command(parser.parse_args()))
