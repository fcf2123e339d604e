"""Pictures of attention: heatmaps (plotting.py), the numbers beside them (map_stats.py) and
subwords merged into words (words.py); training draws them too.
"""
