"""llamad benchmarks: peers side by side in one invocation, results as ratios."""
