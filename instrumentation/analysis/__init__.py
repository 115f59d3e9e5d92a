"""Tables and numbers the app's views draw, computed from traces, sweeps and shapes with pandas
and numpy alone: the schedule model and its analyses, block-skip statistics, the online softmax
step by step, HBM and traffic models, decode's roofline model, KV-head sharing."""
