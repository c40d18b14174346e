"""What bench/peers_bench.py drives: llamad, llama-server, llama-cpp-python, and the workload."""
