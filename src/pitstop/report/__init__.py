"""Renderers: a Report in, text out. A renderer never measures."""

from pitstop.report.html import render_html, write_html
from pitstop.report.jsonfmt import load_json, to_json, write_json
from pitstop.report.terminal import print_report

__all__ = ["load_json", "print_report", "render_html", "to_json", "write_html", "write_json"]
