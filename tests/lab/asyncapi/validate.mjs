// Parse an AsyncAPI document with the reference parser (@asyncapi/parser) and print one JSON
// object: every diagnostic (severity 0 = error, 1 = warning, 2 = info, 3 = hint) and what the
// parsed model holds. The parser does not check message examples, so every example's payload and
// headers are validated here against the message's schemas with Ajv (an error diagnostic each).
// Exit status 1 when any diagnostic is an error or the document did not parse.
// Usage: node validate.mjs <asyncapi.json>
import { readFile } from 'node:fs/promises';
import { Parser } from '@asyncapi/parser';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';

const path = process.argv[2];
if (!path) {
  console.error('usage: node validate.mjs <asyncapi.json>');
  process.exit(2);
}
const source = await readFile(path, 'utf8');
const { document, diagnostics } = await new Parser().parse(source, { source: path });
const report = {
  diagnostics: diagnostics.map((d) => ({
    severity: d.severity,
    code: String(d.code),
    message: d.message,
    path: d.path.join('.'),
  })),
  parsed: Boolean(document),
};
if (document) {
  const ajv = new Ajv({ strict: false, allErrors: true });
  addFormats(ajv);
  for (const message of document.messages().all()) {
    for (const [n, example] of message.examples().all().entries()) {
      for (const part of ['payload', 'headers']) {
        const schema = message[part]()?.json();
        if (!schema || example[part]() === undefined) continue;
        const validate = ajv.compile(schema);
        if (!validate(example[part]())) {
          report.diagnostics.push({
            severity: 0,
            code: 'message-example-invalid',
            message: ajv.errorsText(validate.errors),
            path: `components.messages.${message.id()}.examples.${n}.${part}`,
          });
        }
      }
    }
  }
  report.examples = document.messages().all().reduce((k, m) => k + m.examples().all().length, 0);
  report.version = document.version();
  report.channels = document.channels().all().map((c) => c.id());
  report.messages = document.messages().all().map((m) => m.id());
  report.operations = document.operations().all().map((o) => ({
    id: o.id(),
    action: o.action(),
    channels: o.channels().all().map((c) => c.id()),
    messages: o.messages().all().map((m) => m.id()),
  }));
}
console.log(JSON.stringify(report));
process.exit(!document || report.diagnostics.some((d) => d.severity === 0) ? 1 : 0);
