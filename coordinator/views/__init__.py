"""Read views of the farm: metrics, ETA, fleet rows, progress words, schedule, upcoming guesses, Prometheus numbers and `farm plan`'s forecast."""
