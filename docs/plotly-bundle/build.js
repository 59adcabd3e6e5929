// Builds ../../assets/plotly-radt.min.js the way plotly.js builds its own bundles (its esbuild-config.js, version 4.1.1).
const path = require('path');
const esbuild = require('esbuild');
const { environmentPlugin } = require('esbuild-plugin-environment');
const { glsl } = require('esbuild-plugin-glsl');
const InlineCSSPlugin = require('esbuild-plugin-inline-css');
const version = require('plotly.js/package.json').version;

esbuild
    .build({
        entryPoints: [path.join(__dirname, 'entry.js')],
        outfile: path.join(__dirname, '..', '..', 'assets', 'plotly-radt.min.js'),
        banner: { js: `/* plotly.js ${version} (MIT, Plotly, Inc.) with scatter, scattergl, bar and box only, for radt: docs/plotly-bundle/README.md */` },
        format: 'iife',
        globalName: 'Plotly',
        bundle: true,
        minify: true,
        plugins: [InlineCSSPlugin(), glsl({ minify: true }), environmentPlugin({ NODE_DEBUG: false })],
        alias: { regl: '@plotly/regl', stream: 'stream-browserify' },
        define: { global: 'window', 'define.amd': 'false' },
        target: 'es2016',
        logLevel: 'warning'
    })
    .then(() => console.log(`assets/plotly-radt.min.js: plotly.js ${version}`));
