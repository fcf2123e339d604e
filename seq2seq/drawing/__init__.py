"""Pictures of attention: heatmaps (plotting.py) and subwords merged into words (words.py);
training draws them too.
"""
