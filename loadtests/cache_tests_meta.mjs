// The test list of http-tests/cache-tests (npm http-cache-tests), as the
// suite's own CLI runs it (cli.mjs adds the Surrogate-Control suite), printed
// as JSON for loadtests/cache_tests.py: {id: {kind, depends_on, name}}.
// Usage: node cache_tests_meta.mjs <the package's directory>
import path from 'path'
import { pathToFileURL } from 'url'

const dir = process.argv[2]
const load = async name => (await import(pathToFileURL(path.join(dir, 'tests', name)).href)).default
const suites = await load('index.mjs')
suites.push(await load('surrogate-control.mjs'))
const out = {}
for (const suite of suites) {
  for (const test of suite.tests) {
    if (test.browser_only === true) continue // the CLI skips these too
    out[test.id] = { kind: test.kind || 'required', depends_on: test.depends_on || [], name: test.name }
  }
}
console.log(JSON.stringify(out))
