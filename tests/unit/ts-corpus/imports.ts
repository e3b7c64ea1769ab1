// expect: {"ok":true,"k":"a,b"}
import type { Foo } from "./foo";
import type * as Bar from "./bar";
export type { Foo };
export interface Exported { a: number }
export type Alias = string | number;
type Keys = keyof { a: 1; b: 2 };
const ks: Keys[] = ["a", "b"];
function check<T extends object>(o: T, k: keyof T): boolean { return k in o; }
({ ok: check({ a: 1 }, "a"), k: ks.join(",") })
