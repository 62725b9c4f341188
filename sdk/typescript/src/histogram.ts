/**
 * Shuffled histograms with fake reports, the device side (`crowdmix.client.histogram`):
 * one real report (the value, or its k-RR output with local ε_L) and Binomial(m, q)
 * fake reports, each uniform over the domain, in a uniformly random order. Every
 * payload is the index in indexBytes(d) bytes, so once sealed, real and fake reports
 * are the same length and indistinguishable. Such a metric is sealed or not sent.
 */
import { DomainEncoder, domainValue } from "./basic.js";
import { type Encoding, aboveCeiling } from "./config.js";
import { HistogramParams } from "./params.js";
import { type Schema, decode } from "./proto.js";
import { bernoulliBits, flip, popcount, randomWords, uniformBelow } from "./random.js";
import { type Report, newReportId } from "./report.js";

export class HistogramEncoder extends DomainEncoder<HistogramParams> {
  /** The real report's value: `index`, or its k-RR output with local ε_L. */
  realIndex(index: number): number {
    const p = this.params;
    return p.localEpsilon === null ? index : flip(this.rand, index, p.domainSize, p.keepProbability);
  }

  /** Binomial(m, q) values, each uniform over the domain, independent of the value. */
  fakeIndexes(): number[] {
    const { fakeSlots: m, fakeProbability: q, domainSize: d } = this.params;
    if (m === 0) return [];
    const filled = popcount(bernoulliBits(q, m, randomWords(this.rand, m)));
    return Array.from({ length: filled }, () => uniformBelow(this.rand, d));
  }

  /** All of one device's report values for `value`, in uniformly random order. */
  indexes(value: string | number): number[] {
    const out = [this.realIndex(this.domain.indexOf(value)), ...this.fakeIndexes()];
    for (let i = out.length - 1; i > 0; i--) {
      const j = uniformBelow(this.rand, i + 1);
      [out[i], out[j]] = [out[j]!, out[i]!];
    }
    return out;
  }

  /** One device's reports for one window (1 + Binomial(m, q) of them). */
  encode(value: string | number): Report[] {
    const width = this.params.reportBytes;
    return this.indexes(value).map((i) => {
      const bits = new Uint8Array(width);
      for (let b = 0; b < width; b++) bits[b] = Math.floor(i / 2 ** (8 * b)) & 0xff;
      return { metric: this.metric, cohort: 0, bits, fingerprint: this.fingerprint, reportId: newReportId(this.rand) };
    });
  }
}

// protos/crowdmix.proto: HistogramConfig
const HISTOGRAM_CONFIG: Schema = { 1: ["domainSize", "u"], 2: ["fakeSlots", "u"], 3: ["fakeProbability", "d"], 4: ["localEpsilon", "d"], 5: ["domain", "s*"] };

/**
 * Shuffled histograms for the reporter (`Encoding`): sealed or not sent; a ceiling on the
 * local ε_L, and none at all (the value itself is sent) only with allowUnrandomizedHistograms.
 */
export const histogramEncoding: Encoding = {
  read(m) {
    if (!m.histogram) return undefined;
    const h = decode(m.histogram, HISTOGRAM_CONFIG) as { domainSize: number; fakeSlots: number; fakeProbability: number; localEpsilon: number; domain: string[] };
    const histogram = new HistogramParams({ ...h, localEpsilon: h.localEpsilon || null });
    return [{ histogram, domain: h.domain.length ? h.domain : null, sealedOnly: "a shuffled histogram" }, histogram.fingerprint()];
  },
  ceiling(metric, mc, o) {
    if (!mc.histogram) return undefined;
    const eps = mc.histogram.localEpsilon;
    if (eps !== null) return aboveCeiling(metric, [["ε_L", eps, "maxEpsilon", o.maxEpsilon]]);
    return o.allowUnrandomizedHistograms
      ? null
      : `metric ${metric}: the served histogram sends the value without local randomization (ε_L = inf); allowed only with allowUnrandomizedHistograms`;
  },
  encoder(metric, mc, _secret, rand) {
    if (!mc.histogram) return undefined;
    const enc = new HistogramEncoder(mc.histogram, metric, { randomBytes: rand, domain: mc.domain });
    return (value) => enc.encode(domainValue(value));
  },
};
