"""Front ends of the explorer: pure trace -> plotly figures, session state, Panel and ipywidgets views."""
