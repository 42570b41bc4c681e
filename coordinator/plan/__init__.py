"""The job compiler: a render spec becomes a stage graph of tasks (render, stage 2, DFR, decode,
length), with the cost model and placement that size and place it. Pure: no Redis, no gRPC, no
models; the scheduler and `farm plan` call it, tests call it directly."""
