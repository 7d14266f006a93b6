"""Studies: experiments run with the trainer and the analysis of their committed runs (the top layer: it may
import every package below it; nothing imports it). Pure Python over run files: no torch, no Ray."""
