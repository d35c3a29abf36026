// web/js/format.js: numbers, scales, percents and times as the pages print them. NaN and ±inf
// are data: they print as themselves, never as a blank or a dash.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import {
  agoText, exactLog2, numberText, percentText, powerText, ranksText, scaleText, toDate,
} from '../../../web/js/format.js';

describe('numberText', () => {
  test('prints the non-finite values and absence', () => {
    assert.equal(numberText(NaN), 'NaN');
    assert.equal(numberText(Infinity), '+inf');
    assert.equal(numberText(-Infinity), '-inf');
    assert.equal(numberText(null), '—');
    assert.equal(numberText(undefined), '—');
  });

  test('prints zero and whole numbers below 1e7 as they are', () => {
    assert.equal(numberText(0), '0');
    assert.equal(numberText(-0), '0');
    assert.equal(numberText(42), '42');
    assert.equal(numberText(-42), '-42');
    assert.equal(numberText(1234567), '1234567');
  });

  test('prints very large and very small numbers with an exponent', () => {
    assert.equal(numberText(1e7), '1.00e7');
    assert.equal(numberText(-1e7), '-1.00e7');
    assert.equal(numberText(12345678), '1.23e7');
    assert.equal(numberText(100000.5), '1.00e5');
    assert.equal(numberText(1e-4), '1.00e-4');
    assert.equal(numberText(-0.00012345), '-1.23e-4');
    assert.equal(numberText(2.5e-8), '2.50e-8');
  });

  test('prints the rest to `digits` significant digits (4 by default)', () => {
    assert.equal(numberText(0.5), '0.5');
    assert.equal(numberText(0.001), '0.001');
    assert.equal(numberText(1 / 3), '0.3333');
    assert.equal(numberText(3.14159265), '3.142');
    assert.equal(numberText(123.456), '123.5');
    assert.equal(numberText(65536.5), '65540');
    assert.equal(numberText(99999.5), '100000');
    assert.equal(numberText(1 / 3, 2), '0.33');
    assert.equal(numberText(123.456, 2), '120');
  });
});

describe('exactLog2', () => {
  test('is the exponent of an exact power of two', () => {
    assert.equal(exactLog2(65536), 16);
    assert.equal(exactLog2(1), 0);
    assert.equal(exactLog2(0.5), -1);
    assert.equal(exactLog2(2 ** -24), -24);
  });

  test('is null for anything else', () => {
    for (const x of [3, 65535, 0, -4, Infinity, -Infinity, NaN, null, undefined]) {
      assert.equal(exactLog2(x), null, String(x));
    }
  });
});

describe('powerText', () => {
  test('writes the exponent in superscripts, minus sign included', () => {
    assert.equal(powerText(2, 16), '2¹⁶');
    assert.equal(powerText(2, 0), '2⁰');
    assert.equal(powerText(10, -5), '10⁻⁵');
    assert.equal(powerText(2, -24), '2⁻²⁴');
  });
});

describe('scaleText', () => {
  test('names a power of two and its value', () => {
    assert.equal(scaleText(65536), '2¹⁶ (65536)');
    assert.equal(scaleText(2 ** 30), '2³⁰ (1.07e9)');
    assert.equal(scaleText(2 ** -24), '2⁻²⁴ (5.96e-8)');
    assert.equal(scaleText(1), '2⁰ (1)');
  });

  test('prints any other scale as a number, non-finite ones included', () => {
    assert.equal(scaleText(3), '3');
    assert.equal(scaleText(0.75), '0.75');
    assert.equal(scaleText(0), '0');
    assert.equal(scaleText(NaN), 'NaN');
    assert.equal(scaleText(Infinity), '+inf');
    assert.equal(scaleText(-Infinity), '-inf');
    assert.equal(scaleText(null), '—');
    assert.equal(scaleText(undefined), '—');
  });
});

describe('ranksText', () => {
  test('names a distributed run\'s ranks, nothing for one process', () => {
    assert.equal(ranksText(4), '4 ranks');
    assert.equal(ranksText(2), '2 ranks');
    assert.equal(ranksText(1), '');
    assert.equal(ranksText(0), '');
    assert.equal(ranksText(2.5), '');
    assert.equal(ranksText(null), '');
    assert.equal(ranksText(undefined), '');
  });
});

describe('percentText', () => {
  test('gives one decimal under 10%, whole percents from there', () => {
    assert.equal(percentText(1, 30), '3.3%');
    assert.equal(percentText(1, 1000), '0.1%');
    assert.equal(percentText(99, 1000), '9.9%');
    assert.equal(percentText(1, 10), '10%');
    assert.equal(percentText(1, 3), '33%');
    assert.equal(percentText(2, 3), '67%');
    assert.equal(percentText(3, 3), '100%');
  });

  test('is 0% of nothing', () => {
    assert.equal(percentText(5, 0), '0%');
    assert.equal(percentText(5, null), '0%');
    assert.equal(percentText(0, undefined), '0%');
  });
});

describe('toDate', () => {
  test('reads seconds since the epoch and ISO strings', () => {
    assert.equal(toDate(0)?.toISOString(), '1970-01-01T00:00:00.000Z');
    assert.equal(toDate(1764430001.25)?.toISOString(), '2025-11-29T15:26:41.250Z');
    assert.equal(toDate('2026-01-02T03:04:05Z')?.toISOString(), '2026-01-02T03:04:05.000Z');
  });

  test('is null for no time or an unparseable one', () => {
    assert.equal(toDate(null), null);
    assert.equal(toDate(undefined), null);
    assert.equal(toDate(NaN), null);
    assert.equal(toDate('yesterday-ish'), null);
  });
});

describe('agoText', () => {
  const now = Date.UTC(2026, 0, 2, 12, 0, 0);
  const secondsAgo = (s) => (now - 1000 * s) / 1000;

  test('counts seconds, then minutes, then hours', () => {
    assert.equal(agoText(secondsAgo(0), now), '0s ago');
    assert.equal(agoText(secondsAgo(59), now), '59s ago');
    assert.equal(agoText(secondsAgo(60), now), '1m ago');
    assert.equal(agoText(secondsAgo(3599), now), '59m ago');
    assert.equal(agoText(secondsAgo(3600), now), '1h ago');
    assert.equal(agoText(secondsAgo(86399), now), '23h ago');
  });

  test('never says a time is in the future', () => {
    assert.equal(agoText(secondsAgo(-30), now), '0s ago');
  });

  test('gives the date from a day back, and a dash for no time', () => {
    const old = secondsAgo(86400);
    assert.equal(agoText(old, now), new Date(old * 1000).toLocaleDateString());
    assert.equal(agoText(null, now), '—');
    assert.equal(agoText('not a time', now), '—');
  });
});
