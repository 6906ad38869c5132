"""Recording: the decoder's events, the trace that keeps them (Parquet / Arrow) and the slot index
over a trace. Wing ``recording``, the ground floor: imports no backbone."""
