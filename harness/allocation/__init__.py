"""Layout search (``fidelity allocate``): measured per-group effects of quantization choices, a multiple-choice
knapsack under a byte budget, the proposed layouts emitted in the formats people quantize with, and built."""
