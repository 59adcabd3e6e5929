'use strict';
// plotly.js's core (scatter included) and the other trace types radt draws: scattergl (figures of many points),
// bar and box (comparison figures). tests/test_plotly_bundle.py fails when a figure builder uses another type.
var Plotly = require('plotly.js/lib/core');

Plotly.register([require('plotly.js/lib/scattergl'), require('plotly.js/lib/bar'), require('plotly.js/lib/box')]);

module.exports = Plotly;
