"""PyInstaller hook for Pygments, replacing PyInstaller's own (which bundles every lexer, formatter and style,
about 4.5 MB of Python). The app has Pygments only because ``superqt.utils`` imports its code highlighter when
it is imported; the app never highlights code, so the modules that import statement loads are enough."""

hiddenimports = ["pygments.formatter", "pygments.lexers._mapping", "pygments.modeline", "pygments.plugin",
                 "pygments.styles._mapping", "pygments.util"]
